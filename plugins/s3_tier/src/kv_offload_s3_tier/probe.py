"""What the tier checks once, at build, so that a wrong config fails the build, not every job.

In order, each a :class:`ConfigError` naming the bucket and what to fix:

1. the endpoint answers (a dead endpoint, a TLS certificate not trusted);
2. the credentials exist and are accepted, and the bucket exists (``HeadBucket``: needs
   ``s3:ListBucket``);
3. the prefix is claimed for this block size and format: a marker object
   ``{prefix}/__format__`` written with ``If-None-Match: *`` (a store without conditional PUT
   is read first), or read back; a prefix written by stacks of another block size or format
   (signed or not) is refused, naming both (``s3:PutObject``, ``s3:GetObject``);
4. a probe object can be deleted (``s3:DeleteObject``: eviction needs it).
"""

from __future__ import annotations

import uuid

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, ProfileNotFound
from kv_offload.errors import ConfigError

from .settings import S3TierSettings
from .store import MISSING, S3Store, StoreFailed, error_code

__all__ = ["check_at_build"]

_BAD_CREDENTIALS = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"}
)


def _refused(s: S3TierSettings, what: str, permission: str, exc: ClientError) -> ConfigError:
    code, status = error_code(exc)
    if code in _BAD_CREDENTIALS:
        return ConfigError(
            f"tier {s.tier!r}: {s.where} refused the credentials ({code}) on {what} of "
            f"bucket {s.bucket!r}; check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or the "
            f"profile)"
        )
    return ConfigError(
        f"tier {s.tier!r}: {what} of bucket {s.bucket!r} was refused ({code or status}); the "
        f"credentials need {permission} on bucket {s.bucket!r} (prefix {s.prefix!r})"
    )


def check_at_build(store: S3Store, marker_name: str, marker: str) -> None:
    """Run the checks above with ``store``; ``marker`` is this stack's format marker."""
    s = store.settings
    try:
        _check(store, s, marker_name, marker)
    except (NoCredentialsError, ProfileNotFound) as exc:
        raise ConfigError(
            f"tier {s.tier!r}: no usable credentials for bucket {s.bucket!r} ({exc}); set "
            f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or profile = a profile of "
            f"~/.aws/config"
        ) from None
    except (StoreFailed, BotoCoreError) as exc:
        raise ConfigError(
            f"tier {s.tier!r}: the S3 endpoint for bucket {s.bucket!r} is unreachable "
            f"({exc}); check endpoint_url ({s.endpoint_url or 'AWS'}), region and TLS "
            f"settings"
        ) from None


def _check(store: S3Store, s: S3TierSettings, marker_name: str, marker: str) -> None:
    client = store.client
    try:
        client.head_bucket(Bucket=s.bucket)
    except ClientError as exc:
        code, status = error_code(exc)
        if code in ("NoSuchBucket", "404", "NotFound") or status == 404:
            raise ConfigError(
                f"tier {s.tier!r}: bucket {s.bucket!r} does not exist at "
                f"{s.endpoint_url or 'AWS'}; create it (the tier never creates buckets)",
                key="bucket",
            ) from None
        if status == 403:
            raise ConfigError(
                f"tier {s.tier!r}: access to bucket {s.bucket!r} was refused (403 on "
                f"HeadBucket): the credentials are wrong or lack s3:ListBucket on it",
                key="bucket",
            ) from None
        raise _refused(s, "HeadBucket", "s3:ListBucket", exc) from None
    body = marker.encode()
    try:
        client.put_object(Bucket=s.bucket, Key=marker_name, Body=body, IfNoneMatch="*")
        theirs = marker
    except ClientError as exc:
        code, status = error_code(exc)
        if status == 412 or code == "PreconditionFailed":
            theirs = _read_marker(store, s, marker_name) or marker
        elif status == 501 or code == "NotImplemented":  # no conditional PUT: read first
            theirs = _read_marker(store, s, marker_name) or marker
            if theirs == marker:
                _put(store, s, marker_name, body)
        else:
            raise _refused(s, "PutObject", "s3:PutObject", exc) from None
    if theirs != marker:
        raise ConfigError(
            f"tier {s.tier!r}: prefix {s.prefix!r} of bucket {s.bucket!r} holds blocks of "
            f"another stack ({theirs!r}; this stack writes {marker!r}); use another prefix, "
            f"or the same block_size_bytes and auth settings as the stacks sharing it",
            key="prefix",
        )
    if _read_marker(store, s, marker_name) is None:
        raise ConfigError(
            f"tier {s.tier!r}: the marker {marker_name!r} written to bucket {s.bucket!r} "
            f"cannot be read back; the credentials need s3:GetObject on it"
        )
    probe = f"{s.prefix}/__probe__{uuid.uuid4().hex}"
    _put(store, s, probe, b"probe")
    try:
        answer = client.delete_objects(
            Bucket=s.bucket, Delete={"Objects": [{"Key": probe}], "Quiet": True}
        )
    except ClientError as exc:
        raise _refused(s, "DeleteObjects", "s3:DeleteObject", exc) from None
    if answer.get("Errors"):
        error = answer["Errors"][0]
        raise ConfigError(
            f"tier {s.tier!r}: deleting from bucket {s.bucket!r} was refused "
            f"({error.get('Code')}); the credentials need s3:DeleteObject (eviction deletes)"
        )


def _put(store: S3Store, s: S3TierSettings, name: str, body: bytes) -> None:
    try:
        store.client.put_object(Bucket=s.bucket, Key=name, Body=body)
    except ClientError as exc:
        raise _refused(s, "PutObject", "s3:PutObject", exc) from None


def _read_marker(store: S3Store, s: S3TierSettings, name: str) -> str | None:
    try:
        answer = store.client.get_object(Bucket=s.bucket, Key=name)
    except ClientError as exc:
        if error_code(exc)[0] in MISSING:
            return None
        raise _refused(s, "GetObject", "s3:GetObject", exc) from None
    return bytes(answer["Body"].read()).decode(errors="replace")
