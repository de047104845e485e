"""The tier's config keys, validated once, without touching the network.

Credentials are never config keys: they come from the standard chain of the AWS SDK
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, a named
``profile`` of ``~/.aws/config``, an instance role), so nothing here holds or prints a secret.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kv_offload.block_auth import BlockAuth
from kv_offload.errors import ConfigError

__all__ = ["MIN_PART_BYTES", "S3TierSettings"]

#: S3's smallest multipart part (every part but the last).
MIN_PART_BYTES = 5 * 1024 * 1024
#: S3's largest number of parts in one upload.
MAX_PARTS = 10_000


def _positive(tier: str, name: str, value: Any, *, integer: bool = False) -> None:
    number = isinstance(value, int) or (not integer and isinstance(value, float))
    if isinstance(value, bool) or not number or value <= 0:
        kind = "int" if integer else "number"
        raise ConfigError(
            f"tier {tier!r}: {name} must be a positive {kind}, got {value!r}", key=name
        )


def _optional_string(tier: str, name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"tier {tier!r}: {name} must be a non-empty string", key=name)


@dataclass(frozen=True)
class S3TierSettings:
    tier: str
    endpoint_url: str | None
    bucket: str
    prefix: str
    capacity_blocks: int | None
    capacity_bytes: int | None
    addressing_style: str
    region: str | None
    profile: str | None
    verify: bool | str
    io_threads: int
    lookup_threads: int
    connect_timeout_s: float
    timeout_s: float
    max_attempts: int
    retry_after_s: float
    max_retry_after_s: float
    max_in_flight: int
    lookup_cache: int
    multipart_threshold_bytes: int
    multipart_part_bytes: int
    shared_grace_s: float
    #: signs and checks every object (``auth_key_env``); ``None``: checksums only
    auth: BlockAuth | None = None

    @property
    def where(self) -> str:
        """How messages name the store: ``s3://bucket/prefix at endpoint``."""
        at = self.endpoint_url or "AWS"
        return f"s3://{self.bucket}/{self.prefix} at {at}"

    @classmethod
    def from_args(cls, tier: str, **a: Any) -> S3TierSettings:
        endpoint_url = a["endpoint_url"]
        if endpoint_url is not None and (
            not isinstance(endpoint_url, str)
            or not endpoint_url.startswith(("http://", "https://"))
        ):
            raise ConfigError(
                f"tier {tier!r}: endpoint_url must be an http:// or https:// URL, got "
                f"{endpoint_url!r}",
                key="endpoint_url",
            )
        bucket = a["bucket"]
        if bucket is None:
            raise ConfigError(
                f"tier {tier!r}: bucket is required: name an existing bucket (the tier never "
                f"creates one)",
                key="bucket",
            )
        if not isinstance(bucket, str) or not bucket or "/" in bucket:
            raise ConfigError(
                f"tier {tier!r}: bucket must be a bucket name (no '/'), got {bucket!r}",
                key="bucket",
            )
        prefix = a["prefix"]
        if (
            not isinstance(prefix, str)
            or not prefix
            or prefix.startswith("/")
            or prefix.endswith("/")
            or any(c.isspace() for c in prefix)
        ):
            raise ConfigError(
                f"tier {tier!r}: prefix must be a non-empty string without spaces or a "
                f"leading/trailing '/', got {prefix!r}",
                key="prefix",
            )
        capacity_blocks, capacity_bytes = a["capacity_blocks"], a["capacity_bytes"]
        if (capacity_blocks is None) == (capacity_bytes is None):
            raise ConfigError(
                f"tier {tier!r}: set exactly one of capacity_blocks and capacity_bytes: an "
                f"object store is unbounded, the tier bounds its own use",
                key="capacity_blocks" if capacity_blocks is not None else "capacity_bytes",
            )
        if capacity_blocks is not None:
            _positive(tier, "capacity_blocks", capacity_blocks, integer=True)
        if capacity_bytes is not None:
            _positive(tier, "capacity_bytes", capacity_bytes, integer=True)
        style = a["addressing_style"]
        if style is None:
            style = "path" if endpoint_url is not None else "virtual"
        if style not in ("path", "virtual"):
            raise ConfigError(
                f'tier {tier!r}: addressing_style must be "path" or "virtual", got {style!r}',
                key="addressing_style",
            )
        for name in ("region", "profile", "tls_ca_file"):
            _optional_string(tier, name, a[name])
        verify_tls, ca_file = a["verify_tls"], a["tls_ca_file"]
        if not isinstance(verify_tls, bool):
            raise ConfigError(
                f"tier {tier!r}: verify_tls must be true or false, got {verify_tls!r}",
                key="verify_tls",
            )
        if ca_file is not None and not os.path.isfile(ca_file):
            raise ConfigError(
                f"tier {tier!r}: tls_ca_file {ca_file!r} is not a readable file",
                key="tls_ca_file",
            )
        if ca_file is not None and not verify_tls:
            raise ConfigError(
                f"tier {tier!r}: tls_ca_file is set but verify_tls = false; drop one",
                key="tls_ca_file",
            )
        integers = (
            "io_threads", "lookup_threads", "max_attempts", "max_in_flight", "lookup_cache",
            "multipart_threshold_bytes", "multipart_part_bytes",
        )  # fmt: skip
        for name in integers:
            _positive(tier, name, a[name], integer=True)
        for name in ("connect_timeout_s", "timeout_s", "retry_after_s", "max_retry_after_s"):
            _positive(tier, name, a[name])
        grace = a["shared_grace_s"]
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
            raise ConfigError(
                f"tier {tier!r}: shared_grace_s must be a number >= 0, got {grace!r}",
                key="shared_grace_s",
            )
        if a["max_retry_after_s"] < a["retry_after_s"]:
            raise ConfigError(
                f"tier {tier!r}: max_retry_after_s must be >= retry_after_s",
                key="max_retry_after_s",
            )
        if a["multipart_part_bytes"] < MIN_PART_BYTES:
            raise ConfigError(
                f"tier {tier!r}: multipart_part_bytes must be at least {MIN_PART_BYTES} "
                f"(S3's smallest part), got {a['multipart_part_bytes']}",
                key="multipart_part_bytes",
            )
        auth = BlockAuth.from_arguments(
            tier,
            a["auth_key_env"],
            a["auth_key_previous_env"],
            context=f"kv-offload-s3-tier:{bucket}/{prefix}".encode(),
        )
        return cls(
            tier=tier,
            endpoint_url=endpoint_url,
            bucket=bucket,
            prefix=prefix,
            capacity_blocks=capacity_blocks,
            capacity_bytes=capacity_bytes,
            addressing_style=style,
            region=a["region"],
            profile=a["profile"],
            verify=ca_file if ca_file is not None else verify_tls,
            io_threads=a["io_threads"],
            lookup_threads=a["lookup_threads"],
            connect_timeout_s=float(a["connect_timeout_s"]),
            timeout_s=float(a["timeout_s"]),
            max_attempts=a["max_attempts"],
            retry_after_s=float(a["retry_after_s"]),
            max_retry_after_s=float(a["max_retry_after_s"]),
            max_in_flight=a["max_in_flight"],
            lookup_cache=a["lookup_cache"],
            multipart_threshold_bytes=a["multipart_threshold_bytes"],
            multipart_part_bytes=a["multipart_part_bytes"],
            shared_grace_s=float(grace),
            auth=auth,
        )

    def capacity_for(self, object_bytes: int) -> int:
        """The bound in objects: ``capacity_blocks``, or ``capacity_bytes`` of objects of
        ``object_bytes`` each (a :class:`ConfigError` if that is not even one)."""
        if self.capacity_blocks is not None:
            return self.capacity_blocks
        count = (self.capacity_bytes or 0) // object_bytes  # from_args: one of the two is set
        if count < 1:
            raise ConfigError(
                f"tier {self.tier!r}: capacity_bytes {self.capacity_bytes} holds no object of "
                f"{object_bytes} bytes (one block and its header)",
                key="capacity_bytes",
            )
        return count

    def parts_of(self, object_bytes: int) -> int:
        """How many parts an object of ``object_bytes`` is uploaded in (1: one PUT)."""
        if object_bytes <= self.multipart_threshold_bytes:
            return 1
        return min(MAX_PARTS, -(-object_bytes // self.multipart_part_bytes))
