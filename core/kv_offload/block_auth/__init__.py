"""Authenticated blocks for shared tiers: a MAC keyed by a secret only trusted engines hold.

A tier shared by many engines (Redis, a network filesystem) serves whatever sits in it to
every engine that looks the key up, and a checksum in a public format proves nothing: anyone
who can write there can plant a block with a valid checksum, or copy a real block under another
key. With ``auth_key_env = "VAR"`` a tier signs every block it stores with a key derived from
the secret in ``$VAR`` and serves only blocks whose tag verifies; a writer without the secret
cannot make one.

For tier authors, :class:`BlockAuth` is the whole job:

* :meth:`BlockAuth.from_arguments` reads ``auth_key_env`` / ``auth_key_previous_env`` (call it
  from the tier's ``validate_arguments`` too, so ``kv-offload validate`` finds an unset
  variable, a short secret or a previous key without a current one: a
  :class:`~kv_offload.errors.ConfigError` naming the key, never the secret);
* :meth:`BlockAuth.sign` returns a fixed-size record (:data:`RECORD_SIZE` bytes: algorithm,
  key id, tag) to store in the block's header;
* :meth:`BlockAuth.verify` checks a record against what the reader expects and returns
  ``None`` or an :class:`AuthFailure` (``kind`` in :data:`AUTH_KINDS`) - the block must then
  be a miss (a failed load), never copied into the CPU buffer or served;
* :class:`AuthFailureLog` reports failures once per kind, then as counted summaries.

What the tag covers: the tier's ``context`` (so a block of one tier or namespace cannot be
replayed into another), the algorithm and key id, the block's key, its size, the tier's
format version and every payload byte. The tag is keyed BLAKE3 (the ``blake3`` package, a
dependency of the shipped tiers: ~2-8 GB/s a core, the GIL released) or, where ``blake3`` is
not installed, HMAC-SHA256 from the standard library. A reader verifies with the algorithm
the record names; one without ``blake3`` fails BLAKE3 records with kind ``"algorithm"``.

Rotation: the record carries a 32-bit key id derived from the secret. Writers sign with the
current secret; readers accept the current and, if ``auth_key_previous_env`` is set, the
previous one. A record of an unknown key id (signed with a secret this reader does not hold,
e.g. the next one during a rolling rotation) fails with kind ``"unknown_key"``; a tier that
live engines share should leave such a block in place (the Redis tier does; the fs tier,
whose root has a single owner process, deletes it like any block it cannot verify).

The secret never leaves :mod:`kv_offload.block_auth.keys`: objects keep only derived keys and
show key ids (``repr``), error messages name the variable, never its value. Failures are
reported by :mod:`kv_offload.block_auth.log`.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .keys import MIN_SECRET_BYTES, DerivedKeys, blake3_available, read_secret
from .log import AuthFailureLog

__all__ = [
    "ALGORITHMS",
    "AUTH_KEY_ENV",
    "AUTH_KEY_PREVIOUS_ENV",
    "AUTH_KINDS",
    "MIN_SECRET_BYTES",
    "RECORD_SIZE",
    "AuthFailure",
    "AuthFailureLog",
    "BlockAuth",
    "blake3_available",
    "check_arguments",
]

#: The config keys every authenticating tier accepts.
AUTH_KEY_ENV = "auth_key_env"
AUTH_KEY_PREVIOUS_ENV = "auth_key_previous_env"
#: A shorter secret is refused: 128 bits is the least a MAC key should carry.
#: Algorithm ids as stored in a record.
ALGORITHMS = {1: "blake3", 2: "hmac-sha256"}
_ALGORITHM_IDS = {name: number for number, name in ALGORITHMS.items()}
#: algorithm (u8), reserved (u8, u16: zero), key id (u32), tag (32 bytes)
_RECORD = struct.Struct("<BBHI32s")
RECORD_SIZE = _RECORD.size
#: What the tag covers besides the payload (domain string, then the fields below).
_DOMAIN = b"kv-offload authenticated block v1\x00"
_PREFIX = struct.Struct("<BIQHH")  # algorithm, key id, block size, format version, key length
#: Failure kinds :meth:`BlockAuth.verify` returns (tiers add ``unsigned`` / ``signed``).
AUTH_KINDS = ("bad_record", "algorithm", "unknown_key", "bad_mac", "unsigned", "signed")


@dataclass(frozen=True)
class AuthFailure:
    """Why a block was not authentic: ``kind`` (one of :data:`AUTH_KINDS`) and a message
    (never containing the secret)."""

    kind: str
    message: str


class BlockAuth:
    """Signs and verifies blocks with the current secret (and accepts the previous one).

    ``context`` binds tags to where the block lives (the tier type, a namespace): a block
    signed for one context never verifies in another. ``algorithm`` is ``"blake3"`` (the
    default when the package is installed) or ``"hmac-sha256"``.
    """

    __slots__ = ("_algorithm", "_context", "_current", "_keys", "_previous")

    def __init__(
        self,
        current: bytes,
        previous: bytes | None = None,
        *,
        context: bytes,
        algorithm: str | None = None,
    ) -> None:
        if len(current) < MIN_SECRET_BYTES or (
            previous is not None and len(previous) < MIN_SECRET_BYTES
        ):
            raise ConfigError(f"a block authentication secret needs {MIN_SECRET_BYTES}+ bytes")
        name = algorithm or ("blake3" if blake3_available() else "hmac-sha256")
        if name not in _ALGORITHM_IDS:
            raise ConfigError(
                f"block authentication algorithm {name!r} is unknown; use one of "
                f"{', '.join(map(repr, _ALGORITHM_IDS))}"
            )
        if name == "blake3" and not blake3_available():
            raise ConfigError(
                "block authentication with 'blake3' needs the blake3 package: "
                "pip install blake3 (or use 'hmac-sha256')"
            )
        self._algorithm = _ALGORITHM_IDS[name]
        self._context = bytes(context)
        self._current = DerivedKeys(current)
        self._previous = None if previous is None else DerivedKeys(previous)
        self._keys = {self._current.key_id: self._current}
        if self._previous is not None:
            if self._previous.key_id == self._current.key_id:
                raise ConfigError(
                    "the previous block authentication secret equals the current one (same "
                    "key id); set auth_key_previous_env only while rotating to a new secret",
                    key=AUTH_KEY_PREVIOUS_ENV,
                )
            self._keys[self._previous.key_id] = self._previous

    @classmethod
    def from_arguments(
        cls,
        tier: str,
        auth_key_env: Any = None,
        auth_key_previous_env: Any = None,
        *,
        context: bytes,
        algorithm: str | None = None,
    ) -> BlockAuth | None:
        """The tier's authenticator from its two config keys, ``None`` when
        ``auth_key_env`` is unset. Every mistake is a :class:`ConfigError` naming the key."""
        if auth_key_env is None:
            if auth_key_previous_env is not None:
                raise ConfigError(
                    f"tier {tier!r}: {AUTH_KEY_PREVIOUS_ENV} is set but {AUTH_KEY_ENV} is not; "
                    f"the previous secret is only accepted next to a current one (set "
                    f"{AUTH_KEY_ENV}, or drop {AUTH_KEY_PREVIOUS_ENV})",
                    key=AUTH_KEY_PREVIOUS_ENV,
                )
            return None
        current = read_secret(tier, AUTH_KEY_ENV, auth_key_env)
        previous = None
        if auth_key_previous_env is not None:
            if auth_key_previous_env == auth_key_env:
                raise ConfigError(
                    f"tier {tier!r}: {AUTH_KEY_PREVIOUS_ENV} names the same variable as "
                    f"{AUTH_KEY_ENV} ({auth_key_env!r}); it must hold the secret being retired",
                    key=AUTH_KEY_PREVIOUS_ENV,
                )
            previous = read_secret(tier, AUTH_KEY_PREVIOUS_ENV, auth_key_previous_env)
        try:
            return cls(current, previous, context=context, algorithm=algorithm)
        except ConfigError as exc:
            raise ConfigError(f"tier {tier!r}: {exc}", key=exc.key or AUTH_KEY_ENV) from None

    @property
    def algorithm(self) -> str:
        return ALGORITHMS[self._algorithm]

    @property
    def key_id(self) -> int:
        """The current secret's key id (what :meth:`sign` writes)."""
        return self._current.key_id

    @property
    def key_ids(self) -> tuple[int, ...]:
        """The key ids this reader accepts: current, then previous."""
        return tuple(self._keys)

    def __repr__(self) -> str:
        previous = "" if self._previous is None else f", previous={self._previous.key_id:#010x}"
        return f"BlockAuth({self.algorithm}, key_id={self.key_id:#010x}{previous})"

    def __reduce__(self) -> Any:
        raise TypeError("a BlockAuth is not picklable: it holds keys derived from a secret")

    def _prefix(
        self, algorithm: int, key_id: int, key: bytes, block_size: int, version: int
    ) -> bytes:
        context = self._context
        return b"".join(
            (
                _DOMAIN,
                len(context).to_bytes(2, "little"),
                context,
                _PREFIX.pack(algorithm, key_id, block_size, version, len(key)),
                key,
            )
        )

    def sign(self, key: bytes, block_size: int, format_version: int, payload: Any) -> bytes:
        """The record (:data:`RECORD_SIZE` bytes) of ``payload`` (any buffer, hashed in
        place), stored under ``key`` in a block of ``block_size`` bytes."""
        algorithm, signer = self._algorithm, self._current
        prefix = self._prefix(algorithm, signer.key_id, key, block_size, format_version)
        return _RECORD.pack(algorithm, 0, 0, signer.key_id, signer.tag(algorithm, prefix, payload))

    def verify(
        self, record: Any, key: bytes, block_size: int, format_version: int, payload: Any
    ) -> AuthFailure | None:
        """``None`` if ``record`` is a valid tag of ``payload`` for ``key`` (by the current
        or previous secret), else why not. The tag is compared in constant time."""
        view = memoryview(record)
        if view.nbytes != RECORD_SIZE:
            return AuthFailure("bad_record", f"an authentication record of {view.nbytes} bytes")
        algorithm, reserved, reserved2, key_id, tag = _RECORD.unpack(view)
        if reserved or reserved2:
            return AuthFailure("bad_record", "damaged authentication record")
        if algorithm not in ALGORITHMS:
            return AuthFailure("algorithm", f"unknown authentication algorithm id {algorithm}")
        if algorithm == 1 and not blake3_available():
            return AuthFailure(
                "algorithm", "signed with keyed BLAKE3 and the blake3 package is not installed"
            )
        signer = self._keys.get(key_id)
        if signer is None:
            accepted = ", ".join(f"{k:#010x}" for k in self._keys)
            return AuthFailure(
                "unknown_key",
                f"signed with key id {key_id:#010x}, this reader holds {accepted} (another "
                f"tenant's secret, or a rotation not rolled out here yet)",
            )
        expected = signer.tag(
            algorithm, self._prefix(algorithm, key_id, key, block_size, format_version), payload
        )
        if not hmac.compare_digest(expected, tag):
            return AuthFailure(
                "bad_mac", f"authentication tag mismatch (key id {key_id:#010x}): forged or damaged"
            )
        return None


def check_arguments(tier: str, arguments: Mapping[str, Any]) -> None:
    """``validate_arguments`` helper: the two auth keys of ``arguments`` are usable."""
    BlockAuth.from_arguments(
        tier,
        arguments.get(AUTH_KEY_ENV),
        arguments.get(AUTH_KEY_PREVIOUS_ENV),
        context=b"validate",
    )
