"""The secret behind authenticated blocks: read from the environment, turned into keys.

The secret never leaves this module: a :class:`DerivedKeys` keeps only keys derived from it
(BLAKE2b with a distinct personalisation each: the key id, the BLAKE3 key, the HMAC key) and
shows its key id; error messages name the variable, never its value.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError

__all__ = ["MIN_SECRET_BYTES", "DerivedKeys", "blake3_available", "read_secret"]

MIN_SECRET_BYTES = 16

_blake3: Any
try:
    import blake3 as _blake3
except ImportError:  # pragma: no cover - the shipped tiers depend on blake3
    _blake3 = None


def blake3_available() -> bool:
    """Whether keyed BLAKE3 can be used here (the ``blake3`` package is importable)."""
    return _blake3 is not None


class DerivedKeys:
    """The keys derived from one secret; the secret itself is not kept."""

    __slots__ = ("_blake3_key", "_hmac_key", "key_id")

    def __init__(self, secret: bytes) -> None:
        self.key_id = int.from_bytes(
            hashlib.blake2b(secret, digest_size=4, person=b"kvo-key-id").digest(), "little"
        )
        self._blake3_key = hashlib.blake2b(secret, digest_size=32, person=b"kvo-blake3").digest()
        self._hmac_key = hashlib.blake2b(secret, digest_size=32, person=b"kvo-hmac").digest()

    def __repr__(self) -> str:
        return f"<key id {self.key_id:#010x}>"

    def tag(self, algorithm: int, prefix: bytes, payload: Any) -> bytes:
        if algorithm == 1:
            if _blake3 is None:  # pragma: no cover - the callers check first
                raise RuntimeError("keyed BLAKE3 needs the blake3 package")
            hasher = _blake3.blake3(prefix, key=self._blake3_key)
            hasher.update(payload)
            return bytes(hasher.digest())
        mac = hmac.new(self._hmac_key, prefix, "sha256")
        mac.update(payload)
        return mac.digest()


def read_secret(tier: str, config_key: str, variable: Any) -> bytes:
    """The secret in environment variable ``variable`` (named by config key ``config_key``
    of tier ``tier``): set, and at least :data:`MIN_SECRET_BYTES` bytes."""
    if not isinstance(variable, str) or not variable:
        raise ConfigError(
            f"tier {tier!r}: {config_key} must name an environment variable holding the "
            f"secret, got {variable!r}",
            key=config_key,
        )
    environ: Mapping[Any, Any] = os.environb if os.supports_bytes_environ else os.environ
    name: Any = os.fsencode(variable) if os.supports_bytes_environ else variable
    value = environ.get(name)
    if value is None:
        raise ConfigError(
            f"tier {tier!r}: environment variable {variable!r} ({config_key}) is not set; "
            f"export it with a random secret of at least {MIN_SECRET_BYTES} bytes (e.g. "
            f"`openssl rand -base64 32`), the same on every engine of this tenant",
            key=config_key,
        )
    secret = value if isinstance(value, bytes) else str(value).encode()
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"tier {tier!r}: the secret in {variable!r} ({config_key}) is {len(secret)} bytes, "
            f"at least {MIN_SECRET_BYTES} are needed; use a random one (e.g. "
            f"`openssl rand -base64 32`)",
            key=config_key,
        )
    return bytes(secret)
