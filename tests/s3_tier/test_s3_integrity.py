"""What the S3 tier serves is exactly what it stored: objects damaged, cut short, copied under
another key's name, planted in the tier's format, or signed by another tenant's secret are
misses, never bytes in the CPU buffer (real radosgw; objects changed with a plain S3 client,
as anyone holding the bucket's credentials could)."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from _ceph import BUCKET, CephS3
from _s3_stack import BLOCK, Direct, clear_prefix
from _tiers import block_bytes, key
from kv_offload_s3_tier import codec
from kv_offload_s3_tier.layout import Layout

SECRET = "kvo-s3-tenant-secret-0123456789abcdef"
OTHER_SECRET = "kvo-s3-another-tenant-fedcba9876543210"


@pytest.fixture(autouse=True)
def _cleanup(ceph: CephS3, prefix: str):  # type: ignore[no-untyped-def]
    yield
    clear_prefix(ceph, prefix)


def _raw(ceph: CephS3, name: str) -> bytes:
    return bytes(ceph.client().get_object(Bucket=BUCKET, Key=name)["Body"].read())


def _plant(ceph: CephS3, name: str, body: bytes) -> None:
    ceph.client().put_object(Bucket=BUCKET, Key=name, Body=body)


def _exists(ceph: CephS3, name: str) -> bool:
    listed = ceph.client().list_objects_v2(Bucket=BUCKET, Prefix=name)
    return any(o["Key"] == name for o in listed.get("Contents", ()))


def _never_served(tier: Direct, keys: list[bytes]) -> None:
    """Each key's load fails it alone, and its slot holds nothing of the object (zeros)."""
    result = tier.load(keys)
    assert not result.success or result.failed_keys == set(keys), result
    assert not np.any(tier.cpu[: len(keys)]), "bytes of a refused object reached the CPU buffer"


def test_a_damaged_or_truncated_object_is_a_miss_and_deleted(s3_env: CephS3, prefix: str) -> None:
    writer = Direct(s3_env, prefix)
    keys = [key(i) for i in range(4)]
    assert writer.store(keys).success
    writer.close()
    layout = Layout(prefix)
    flipped = bytearray(_raw(s3_env, layout.name(keys[0])))
    flipped[-100] ^= 0x01  # one bit of the payload
    _plant(s3_env, layout.name(keys[0]), bytes(flipped))
    whole = _raw(s3_env, layout.name(keys[1]))
    _plant(s3_env, layout.name(keys[1]), whole[: len(whole) // 2])  # cut short
    _plant(s3_env, layout.name(keys[2]), whole[:20])  # shorter than the header

    reader = Direct(s3_env, prefix)
    _never_served(reader, keys[:3])
    assert reader.tier.stats.corrupt_objects == 3
    # the good neighbour is served, in a job with the bad ones
    result = reader.load([keys[0], keys[3]])
    assert result.success and result.failed_keys == {keys[0]}
    assert bytes(reader.cpu[1]) == block_bytes(keys[3], BLOCK)
    reader.close()
    # worthless to every reader: deleted, so the next lookup is a miss
    assert not any(_exists(s3_env, layout.name(k)) for k in keys[:3])
    assert _exists(s3_env, layout.name(keys[3]))


def test_a_block_copied_under_another_keys_name_is_never_served(
    s3_env: CephS3, prefix: str
) -> None:
    writer = Direct(s3_env, prefix)
    assert writer.store([key(1), key(2)]).success
    writer.close()
    layout = Layout(prefix)
    _plant(s3_env, layout.name(key(2)), _raw(s3_env, layout.name(key(1))))
    reader = Direct(s3_env, prefix)
    _never_served(reader, [key(2)])
    assert reader.load([key(1)]).success and reader.loaded_right([key(1)]) == [True]
    reader.close()


def test_a_planted_object_in_the_tiers_format_is_refused_under_auth(
    s3_env: CephS3, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forger without the secret writes a well-formed, correctly checksummed block: an
    authenticated stack refuses it (unsigned) and deletes it; a real block's MAC record
    spliced onto other bytes fails its MAC."""
    monkeypatch.setenv("KVO_S3_KEY", SECRET)
    writer = Direct(s3_env, prefix, auth_key_env="KVO_S3_KEY")
    assert writer.store([key(1)]).success
    writer.close()
    layout = Layout(prefix)
    real = _raw(s3_env, layout.name(key(1)))
    forged = b"\x66" * BLOCK
    k = key(50)
    checksum = xxhash.xxh3_64_intdigest(forged)
    unsigned = codec.HEADER.pack(codec.MAGIC, codec.FORMAT_VERSION, len(k), 0, BLOCK, checksum)
    _plant(s3_env, layout.name(k), unsigned + k + forged)
    k2 = key(51)
    record = real[codec.HEADER.size - 8 : codec.AUTH_HEADER.size]  # its key id and MAC
    head = codec.AUTH_HEADER.pack(codec.MAGIC, codec.AUTH_FORMAT_VERSION, len(k2), 0, BLOCK, record)
    _plant(s3_env, layout.name(k2), head + k2 + forged)

    reader = Direct(s3_env, prefix, auth_key_env="KVO_S3_KEY")
    _never_served(reader, [k, k2])
    assert reader.tier.get_stats()["auth_failures"] == {"unsigned": 1, "bad_mac": 1}
    assert reader.load([key(1)]).success and reader.loaded_right([key(1)]) == [True]
    reader.close()
    assert not _exists(s3_env, layout.name(k)) and not _exists(s3_env, layout.name(k2))


def test_another_tenants_secret_serves_nothing_and_deletes_nothing(
    s3_env: CephS3, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVO_S3_KEY", SECRET)
    monkeypatch.setenv("KVO_S3_OTHER", OTHER_SECRET)
    writer = Direct(s3_env, prefix, auth_key_env="KVO_S3_KEY")
    keys = [key(i) for i in range(3)]
    assert writer.store(keys).success
    writer.close()
    stranger = Direct(s3_env, prefix, auth_key_env="KVO_S3_OTHER")
    _never_served(stranger, keys)
    assert sum(stranger.tier.get_stats()["auth_failures"].values()) == 3
    stranger.close()
    layout = Layout(prefix)
    assert all(_exists(s3_env, layout.name(k)) for k in keys)  # the owner's blocks stay
    owner = Direct(s3_env, prefix, auth_key_env="KVO_S3_KEY")
    assert owner.load(keys).success and all(owner.loaded_right(keys))
    owner.close()
