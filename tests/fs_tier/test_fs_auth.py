"""Authenticated blocks in the fs tier (``auth_key_env``), against real files.

A writer to a shared root without the secret cannot make a block the tier serves: a forged
file in the public format (valid checksum), a real file swapped under another key with its key
field rewritten, files of another tenant - each is a failed promotion (a MISS), counted, and
reported once per kind; the right secret round-trips the exact bytes.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest
import xxhash
from _fs import BLOCK, HIT, MISS, build_fs_stack, check_no_leaks, evict_from_cpu
from _fs import promote as _promote
from _fs import store as _store
from _tiers import key
from kv_offload import ReqContext, TieringOffloadingManager
from kv_offload_fs_tier import FileSystemTier
from kv_offload_fs_tier.layout import key_name, shard_of

SECRET = "tenant-a-secret-0123456789abcdef"
OTHER = "tenant-b-secret-fedcba9876543210"
NEXT = "tenant-a-next-secret-00112233445"
HEADER = 4096


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVO_FS_KEY", SECRET)
    monkeypatch.setenv("KVO_FS_OTHER", OTHER)
    monkeypatch.setenv("KVO_FS_NEXT", NEXT)


def stack(root: Path, **auth: str) -> tuple[TieringOffloadingManager, FileSystemTier]:
    m = build_fs_stack(root, cpu_blocks=4, **auth)
    tier = m.tiers[0]
    assert isinstance(tier, FileSystemTier)
    return m, tier


def write(root: Path, keys: list[int], **auth: str) -> None:
    """A writer stores ``keys`` (their bytes derived from the key) and shuts down."""
    m, _ = stack(root, **auth)
    ctx = ReqContext("w")
    _store(m, [key(i) for i in keys], ctx)
    m.shutdown()


def path_of(root: Path, k: bytes) -> Path:
    return root / "blocks" / f"{shard_of(k):02x}" / key_name(k)


def promote_all(m: TieringOffloadingManager, keys: list[int]) -> list[object]:
    ctx = ReqContext("r")
    evict_from_cpu(m, ctx)
    return [_promote(m, key(i), ctx) for i in keys]  # a HIT's bytes are checked


def test_the_right_secret_round_trips_exact_bytes(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    write(root, [1, 2, 3], auth_key_env="KVO_FS_KEY")
    data = path_of(root, key(1)).read_bytes()
    assert struct.unpack_from("<I", data, 12)[0] == 1  # flagged as authenticated
    assert SECRET.encode() not in data
    m, tier = stack(root, auth_key_env="KVO_FS_KEY")
    assert promote_all(m, [1, 2, 3]) == [HIT, HIT, HIT]
    assert tier.get_stats().auth_failures == 0
    check_no_leaks(m)
    m.shutdown()


def test_a_forged_file_with_a_valid_checksum_is_never_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Planted in the public (unsigned) format, and with a real block's key id and a made-up
    tag: neither is served, both are deleted, the first of each kind is logged once."""
    root = tmp_path / "fs"
    write(root, [1], auth_key_env="KVO_FS_KEY")
    real = path_of(root, key(1)).read_bytes()
    for i, signed in ((50, False), (51, True), (52, True)):
        k = key(i)
        payload = b"\x66" * BLOCK  # what the forger wants engines to load
        if signed:  # the real block's record: its key id and tag, for other bytes
            head = struct.pack("<8sHHIQQ", b"KVOFSBLK", 1, len(k), 1, BLOCK, 0)
            head += k + real[32 + len(k) : 32 + len(k) + 40]
            if i == 52:  # and with a made-up tag under that key id
                head = head[:-32] + bytes(32)
        else:
            head = struct.pack(
                "<8sHHIQQ", b"KVOFSBLK", 1, len(k), 0, BLOCK, xxhash.xxh3_64_intdigest(payload)
            )
            head += k
        path_of(root, k).write_bytes(head.ljust(HEADER, b"\0") + payload)
    m, tier = stack(root, auth_key_env="KVO_FS_KEY")
    with caplog.at_level(logging.WARNING, "kv_offload.fs_tier"):
        assert promote_all(m, [50, 51, 52, 1]) == [MISS, MISS, MISS, HIT]
    stats = tier.get_stats()
    assert stats.auth_failures == 3
    assert stats.drop_reasons == {"unsigned": 1, "bad_mac": 2}
    assert m.get_stats().tiers[0].failed_promotions == 3
    for i in (50, 51, 52):
        assert not path_of(root, key(i)).exists()  # deleted
        assert m.primary.ref_count(key(i)) is None
    auth_lines = [r for r in caplog.records if "failed authentication" in r.getMessage()]
    assert len(auth_lines) == 2  # once per kind (unsigned, bad_mac), not once per block
    check_no_leaks(m)
    m.shutdown()


def test_a_real_block_swapped_under_another_key_is_never_served(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    write(root, [1, 2], auth_key_env="KVO_FS_KEY")
    source = bytearray(path_of(root, key(2)).read_bytes())
    target = key(1)
    source[32 : 32 + len(target)] = target  # the key field rewritten to the victim's key
    path_of(root, target).write_bytes(bytes(source))
    m, tier = stack(root, auth_key_env="KVO_FS_KEY")
    assert promote_all(m, [1, 2]) == [MISS, HIT]
    assert tier.get_stats().drop_reasons == {"bad_mac": 1}
    m.shutdown()


def test_another_tenants_secret_serves_none(tmp_path: Path) -> None:
    """Files signed with a secret the tier does not hold are misses and deleted (the root has
    one owner: no reader could use them; kept, they would hold disk outside the capacity)."""
    root = tmp_path / "fs"
    write(root, [1, 2, 3], auth_key_env="KVO_FS_KEY")
    m, tier = stack(root, auth_key_env="KVO_FS_OTHER")
    assert promote_all(m, [1, 2, 3]) == [MISS, MISS, MISS]
    stats = tier.get_stats()
    assert stats.drop_reasons == {"unknown_key": 3} and stats.auth_failures == 3
    assert not any(path_of(root, key(i)).exists() for i in (1, 2, 3))
    m.shutdown()


def test_rotation_accepts_the_previous_secret_and_signs_with_the_current(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    write(root, [1, 2], auth_key_env="KVO_FS_KEY")
    rotated = {"auth_key_env": "KVO_FS_NEXT", "auth_key_previous_env": "KVO_FS_KEY"}
    m, _ = stack(root, **rotated)
    assert promote_all(m, [1, 2]) == [HIT, HIT]
    _store(m, [key(3)], ReqContext("w2"))
    m.shutdown()
    m, tier = stack(root, auth_key_env="KVO_FS_NEXT")  # the old secret retired
    assert promote_all(m, [3, 1]) == [HIT, MISS]
    assert tier.get_stats().drop_reasons == {"unknown_key": 1}
    m.shutdown()


def test_a_tier_without_auth_refuses_signed_files_and_an_authenticated_one_unsigned(
    tmp_path: Path,
) -> None:
    root = tmp_path / "fs"
    write(root, [1], auth_key_env="KVO_FS_KEY")
    write(root, [2])
    write(root, [3], auth_key_env="KVO_FS_KEY")
    m, tier = stack(root)
    assert promote_all(m, [1, 2]) == [MISS, HIT]
    assert tier.get_stats().drop_reasons == {"signed": 1}
    m.shutdown()
    m, tier = stack(root, auth_key_env="KVO_FS_KEY")
    assert promote_all(m, [3, 2]) == [HIT, MISS]
    assert tier.get_stats().drop_reasons == {"unsigned": 1}
    m.shutdown()


def test_the_secret_is_nowhere_in_repr_stats_or_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "fs"
    write(root, [1], auth_key_env="KVO_FS_KEY")
    with caplog.at_level(logging.DEBUG):
        m, tier = stack(root, auth_key_env="KVO_FS_OTHER")
        assert promote_all(m, [1]) == [MISS]
        shown = [repr(tier), repr(tier.settings), repr(tier.get_stats()), caplog.text]
        m.shutdown()
    assert "BlockAuth(" in repr(tier.settings)
    for text in shown:
        assert SECRET not in text and OTHER not in text
